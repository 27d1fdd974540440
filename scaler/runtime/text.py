"""Words for counts in what we print: "1 function", "2 functions"."""


def plural(n: int, noun: str, nouns: str = "") -> str:
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"
