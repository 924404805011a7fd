"""Sources, sampling and index math."""
