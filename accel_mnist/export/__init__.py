"""Exported models: writing, loading, evaluating and predicting with them."""
