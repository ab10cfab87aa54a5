"""A module of the example's project: workers import it from the shipped code bundle."""


def summary(values: list[int]) -> dict[str, float]:
    return {"count": len(values), "mean": sum(values) / len(values), "max": max(values)}
