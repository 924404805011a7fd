"""Text records: CSV and JSON lines over one row index, its scan and its on-disk cache."""
