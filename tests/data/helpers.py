"""Shared by the data tests."""
from t2t.data import bundled


def verses(n):
    """The first n World English Bible verses."""
    return [r["text"] for r in bundled.load("web")[:n]]
