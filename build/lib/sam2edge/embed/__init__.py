"""``sam2edge embed``: encode a dataset once into a store of embeddings (local loop or Ray Data)."""
