"""Data: the validation configuration sets as JSON (NAME.json, one per set), loaded by
analysis.validation_configs. No code here."""
