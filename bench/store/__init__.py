"""The results folder: typed JSONL records written and read back, merging slices, and publishing
the report files."""
