"""Post-processing of the `recommend` example pipeline (copied into the package as post.py)."""


def finish(items, scores=None, picked=None, top=3):
    """Three titles: the LLM's picks (treatment), else the candidates xgb-example ranks best
    (control), else the first candidates (a step skipped by its fallback)."""
    if picked:
        return {"titles": list(picked)[:top], "ranked_by": "llm"}
    if scores:
        flat = [row[0] if isinstance(row, list) else row for row in scores]
        ranked = sorted(zip(items, flat, strict=True), key=lambda pair: -pair[1])
        return {"titles": [title for title, _ in ranked[:top]], "ranked_by": "xgb-example"}
    return {"titles": list(items)[:top], "ranked_by": "none"}
