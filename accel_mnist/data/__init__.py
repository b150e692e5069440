"""Data: IDX files, the dataset catalog, Hugging Face datasets, and the on-device data path."""
