"""Tools of the sample rnow project."""

from nemo_gym.rnow import tool

CAPITALS = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi", "peru": "Lima", "canada": "Ottawa"}


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


@tool
def capital(country: str) -> dict:
    """Look up the capital city of a country.

    Args:
        country: the country's English name, e.g. "France"
    """
    city = CAPITALS.get(country.strip().lower())
    return {"country": country, "capital": city} if city else {"error": f"unknown country {country!r}"}
