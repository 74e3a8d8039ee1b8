"""Model cards rendered from card.json, fidelity.json and measured records."""
