"""Segment everything: ``Sam2AutomaticMaskGenerator`` (upstream's API) and its mask utilities."""
