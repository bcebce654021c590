"""Samplers and the torch Dataset/DataLoader glue."""
