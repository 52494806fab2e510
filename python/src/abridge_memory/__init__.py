"""abridge from Python: a typed client of ``abridge serve``.

>>> from abridge_memory import Client
>>> with Client() as ab:
...     ab.add_messages("chat-1", [("user", "hi"), ("assistant", "hello")])
...     ctx = ab.context("chat-1", budget=2000)
...     openai_messages = ctx.to_openai()
"""

__version__ = "0.1.0"

from ._client import AsyncClient, Client
from ._local import local
from ._model import require_model_server
from ._errors import (
    AbridgeError,
    Conflict,
    Forbidden,
    InvalidInput,
    ModelFailed,
    NotFound,
    QuotaExhausted,
    RateLimited,
    ServerUnreachable,
    TooLarge,
    Unauthenticated,
    Unavailable,
    Unprocessable,
    VersionMismatch,
)
from ._models import (
    Appended,
    Cluster,
    ClusterSummary,
    Context,
    ContextParts,
    CreatedToken,
    Episode,
    Event,
    Expansion,
    Hit,
    Imported,
    Job,
    Memory,
    Message,
    Removed,
    SearchHit,
    SearchResults,
    Session,
    StoredMessage,
    Summary,
    Token,
    Usage,
    Written,
)

__all__ = [
    "require_model_server",
    "AbridgeError", "Appended", "Cluster", "ClusterSummary", "AsyncClient", "Client", "Conflict",
    "Context", "ContextParts", "CreatedToken", "Episode", "Removed", "SearchHit", "SearchResults",
    "StoredMessage", "Token",
    "Event", "Expansion", "Forbidden", "Hit", "Imported", "InvalidInput", "Job", "Memory",
    "Message", "ModelFailed", "NotFound", "QuotaExhausted", "RateLimited", "ServerUnreachable",
    "Session", "Summary", "TooLarge", "Unauthenticated", "Unavailable", "Unprocessable", "Usage",
    "VersionMismatch", "Written", "__version__", "local",
]
