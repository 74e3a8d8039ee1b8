"""Export targets: one module per runtime, each a build / convert / verify trio."""
