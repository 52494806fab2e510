"""A LangGraph store item as the memory holding it stores it: a JSON envelope the store reads
back exactly. (Recall shows it as its fields — `key (namespace): field: value` — which the
engine renders for every client.)"""

from __future__ import annotations

import json
from typing import Any, Optional


def item_of(text: str) -> Optional[dict[str, Any]]:
    """The LangGraph item a memory's text holds (``{"namespace", "key", "value"}``), or None."""
    if not text.startswith("{"):
        return None
    try:
        e = json.loads(text)
    except ValueError:
        return None
    ok = isinstance(e, dict) and isinstance(e.get("namespace"), list) and "key" in e and "value" in e
    return e if ok else None
