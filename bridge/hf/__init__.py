"""Hugging Face directories: read, their config's ties, the table of model classes, written."""
