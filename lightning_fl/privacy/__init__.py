"""Privacy mechanisms, clipping and accounting shared by the DP defences."""

__all__: list[str] = []
