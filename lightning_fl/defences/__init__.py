"""Defences: model-level layers (passports, key-lock), update transforms (noise, pruning, DP, Paillier)."""

__all__: list[str] = []
