"""abridge as a Hermes Agent memory provider (``hermes-agent`` on PyPI).

Hermes loads one external memory provider from ``$HERMES_HOME/plugins/<name>/``. Install
this one there and select it::

    pip install --find-links dist 'abridge-memory'      # into Hermes' own environment
    python -m abridge_memory.hermes install             # writes $HERMES_HOME/plugins/abridge/
    hermes memory setup abridge                         # or: memory: {provider: abridge}

What it does in a Hermes turn:

* **prefetch** (before each model call): the memories abridge recalls for the user's message,
  and, once the conversation is longer than Hermes keeps, the summary of what came before
  with the earlier turns that answer the message. Hermes fences it as ``<memory-context>``
  on the user message of that turn (and resends the same bytes later, for prompt caching).
* **sync_turn** (after each turn): the user's message and the answer are stored in the
  abridge session of the Hermes session, which abridge summarizes as it grows.
* **on_pre_compress**: when Hermes compresses its context, the summary abridge keeps of the
  session goes into the compression prompt.
* **tools** ``abridge_remember`` and ``abridge_recall``: durable facts across sessions.

It talks to an ``abridge serve`` (``url``, ``token``) or, by default, starts one of its own
with the ``abridge`` binary (the wheel's, ``$ABRIDGE_BIN`` or the PATH), its database in
``$HERMES_HOME/abridge/abridge.db``. Settings: ``$HERMES_HOME/abridge.json`` (written by
``hermes memory setup abridge``), then the ``ABRIDGE_HERMES_*`` environment variables.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

try:  # Hermes' own base class, when Hermes is installed (it is where this runs).
    from agent.memory_provider import MemoryProvider as _Base
except ImportError:  # pragma: no cover - imported without Hermes (docs, type checks)
    _Base = object  # type: ignore[assignment,misc]

from ._client import Client
from ._errors import AbridgeError
from ._local import installed_binary, local

NAME = "abridge"
CONFIG_FILE = "abridge.json"
# Settings and their defaults; each may also come from ABRIDGE_HERMES_<KEY>.
DEFAULTS: Dict[str, Any] = {
    "url": "",
    "token": "",
    "binary": "",
    "user": "hermes",
    "budget": 1500,
    "recall_k": 4,
    "model_url": "",
}

PLUGIN_INIT = '''"""abridge as a Hermes memory provider: the provider lives in the abridge-memory package
(abridge_memory.hermes); this folder registers it (written by `python -m abridge_memory.hermes
install`)."""
from abridge_memory.hermes import AbridgeMemoryProvider


def register(ctx):
    ctx.register_memory_provider(AbridgeMemoryProvider())
'''

PLUGIN_YAML = """name: abridge
version: {version}
description: "abridge: bounded, exact summaries of the conversation and durable memories, recalled before each turn."
pip_dependencies:
  - abridge-memory
"""


def hermes_home(given: Optional[str] = None) -> Path:
    """Hermes' home: ``given``, else ``$HERMES_HOME``, else ``~/.hermes``."""
    return Path(given or os.environ.get("HERMES_HOME") or Path.home() / ".hermes")


def load_config(home: Optional[str] = None) -> Dict[str, Any]:
    """The provider's settings: defaults, then ``ABRIDGE_HERMES_*``, then abridge.json."""
    cfg = dict(DEFAULTS)
    for key in DEFAULTS:
        v = os.environ.get(f"ABRIDGE_HERMES_{key.upper()}")
        if v:
            cfg[key] = v
    path = hermes_home(home) / CONFIG_FILE
    if path.is_file():
        try:
            cfg.update({k: v for k, v in json.loads(path.read_text()).items() if k in DEFAULTS})
        except (ValueError, OSError) as e:
            raise AbridgeError(
                f"{path} is not valid JSON ({e})",
                hint="fix it, or run `hermes memory setup abridge` again",
            ) from e
    for key in ("budget", "recall_k"):
        try:
            cfg[key] = int(cfg[key])
        except (TypeError, ValueError) as e:
            raise AbridgeError(
                f"the abridge provider's {key} is {cfg[key]!r}, not a number",
                hint=f"set {key} in {path} (or ABRIDGE_HERMES_{key.upper()}) to a whole number",
            ) from e
    return cfg


def session_of(hermes_session: str) -> str:
    """The abridge session of a Hermes session: its id when abridge accepts it as one (letters,
    digits, ``._:-``), else a stable name made from it."""
    s = hermes_session.strip()
    if s and len(s) <= 128 and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]*", s):
        return f"hermes-{s}"
    return "hermes-" + hashlib.sha256(s.encode()).hexdigest()[:32]


class AbridgeMemoryProvider(_Base):  # type: ignore[misc,valid-type]
    """A Hermes ``MemoryProvider`` backed by abridge (see the module)."""

    def __init__(self) -> None:
        self._client: Optional[Client] = None
        self._stack = contextlib.ExitStack()
        self._session = ""
        self._cfg: Dict[str, Any] = dict(DEFAULTS)
        self._writes = True

    # -- identity and availability ------------------------------------------------------
    @property
    def name(self) -> str:
        return NAME

    def is_available(self) -> bool:
        """Configured with a server's URL, or an ``abridge`` binary to start is installed
        (no network call)."""
        try:
            cfg = load_config()
        except AbridgeError:
            return False
        if cfg["url"]:
            return True
        exe = cfg["binary"] or os.environ.get("ABRIDGE_BIN") or installed_binary()
        return bool(exe) and Path(str(exe)).exists()

    # -- lifecycle -------------------------------------------------------------------------
    def initialize(self, session_id: str, **kwargs: Any) -> None:
        home = hermes_home(kwargs.get("hermes_home"))
        self._cfg = load_config(str(home))
        # A cron job's or a subagent's prompts are not the user's conversation.
        self._writes = kwargs.get("agent_context", "primary") == "primary"
        if kwargs.get("user_id") and self._cfg["user"] == DEFAULTS["user"]:
            self._cfg["user"] = str(kwargs["user_id"])
        self._session = session_of(session_id)
        if self._cfg["url"]:
            self._client = self._stack.enter_context(
                Client(self._cfg["url"], token=self._cfg["token"] or None)
            )
            return
        data = home / "abridge"
        data.mkdir(parents=True, exist_ok=True)
        env = {}
        if self._cfg["model_url"]:
            env["EXTRACTION_URL"] = self._cfg["model_url"]
        self._client = self._stack.enter_context(
            local(self._cfg["binary"] or None, db=data / "abridge.db", env=env)
        )

    def on_session_switch(self, new_session_id: str, **kwargs: Any) -> None:
        self._session = session_of(new_session_id)

    def shutdown(self) -> None:
        self._stack.close()
        self._client = None

    # -- what goes into a turn ---------------------------------------------------------------
    def system_prompt_block(self) -> str:
        # Static (it sits in the cached part of the system prompt): what the tools are for.
        return (
            "abridge keeps a bounded summary of this conversation and durable memories. "
            "Before each turn it adds what it recalls in a <memory-context> block. Use "
            "abridge_remember to keep a fact for later sessions and abridge_recall to look one up."
        )

    def prefetch(self, query: str, *, session_id: str = "") -> str:
        if self._client is None or not query.strip():
            return ""
        parts: List[str] = []
        hits = [
            h
            for h in self._client.recall(query, user=self._cfg["user"], k=self._cfg["recall_k"])
            if h.kind == "memory"
        ]
        if hits:
            lines = []
            for h in hits:
                mark = f" (no longer current: replaced by {h.superseded_by})" if h.superseded_by else ""
                lines.append(f"- {h.text}{mark}")
            parts.append("Remembered:\n" + "\n".join(lines))
        session = session_of(session_id) if session_id else self._session
        summary = self._summary(session, query)
        if summary:
            parts.append(summary)
        return "\n\n".join(parts)

    def _summary(self, session: str, query: Optional[str]) -> str:
        """The session's summary and the earlier turns that answer ``query``, when abridge
        holds a summary of it (before that, Hermes' own history holds everything)."""
        try:
            ctx = self._client.context(session, budget=self._cfg["budget"], query=query)  # type: ignore[union-attr]
        except AbridgeError as e:
            if getattr(e, "code", "") == "not_found":
                return ""
            raise
        if ctx.covered == 0:
            return ""
        text = [m.content for m in ctx.messages if m.role == "system"]
        if ctx.note:
            text.append(ctx.note)
        return "\n\n".join(t.strip() for t in text if t.strip())

    def sync_turn(
        self,
        user_content: str,
        assistant_content: str,
        *,
        session_id: str = "",
        messages: Optional[List[Dict[str, Any]]] = None,
    ) -> None:
        if self._client is None or not self._writes:
            return
        session = session_of(session_id) if session_id else self._session
        turn = [
            {"role": r, "content": t}
            for r, t in (("user", user_content), ("assistant", assistant_content))
            if t and t.strip()
        ]
        if turn:
            self._client.add_messages(session, turn)

    def on_pre_compress(self, messages: List[Dict[str, Any]]) -> str:
        if self._client is None:
            return ""
        return self._summary(self._session, None)

    # -- tools ------------------------------------------------------------------------------
    def get_tool_schemas(self) -> List[Dict[str, Any]]:
        return [
            {
                "name": "abridge_remember",
                "description": "Keep a durable fact for later sessions (a decision, a preference, "
                "a convention): one or two sentences. A fact that changes replaces the earlier one.",
                "parameters": {
                    "type": "object",
                    "properties": {"text": {"type": "string", "description": "The fact."}},
                    "required": ["text"],
                },
            },
            {
                "name": "abridge_recall",
                "description": "Look up remembered facts by meaning, most relevant first.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "What to look up."}},
                    "required": ["query"],
                },
            },
        ]

    def handle_tool_call(self, tool_name: str, args: Dict[str, Any], **kwargs: Any) -> str:
        if self._client is None:
            return json.dumps({"error": "abridge is not initialized"})
        try:
            if tool_name == "abridge_remember":
                text = str(args.get("text", "")).strip()
                if not text:
                    return json.dumps({"error": "text is empty; give the fact to remember"})
                w = self._client.remember(text, user=self._cfg["user"])
                return json.dumps({"remembered": w.id, "replaces": w.supersedes})
            if tool_name == "abridge_recall":
                hits = self._client.recall(str(args.get("query", "")), user=self._cfg["user"],
                                           k=self._cfg["recall_k"])
                return json.dumps({"memories": [
                    {"id": h.id, "text": h.text, "superseded_by": h.superseded_by}
                    for h in hits if h.kind == "memory"
                ]})
        except AbridgeError as e:
            return json.dumps({"error": str(e)})
        return json.dumps({"error": f"abridge has no tool {tool_name}"})

    # -- setup (`hermes memory setup abridge`) -----------------------------------------------
    def get_config_schema(self) -> List[Dict[str, Any]]:
        return [
            {"key": "url", "description": "An abridge serve to use (empty: start one with the abridge binary)",
             "default": ""},
            {"key": "token", "description": "Its API token (abridge tokens create)", "secret": True,
             "env_var": "ABRIDGE_HERMES_TOKEN"},
            {"key": "binary", "description": "The abridge binary to start (empty: the wheel's or the PATH's)",
             "default": ""},
            {"key": "model_url", "description": "The Ollama server abridge summarizes with (empty: its default)",
             "default": ""},
            {"key": "user", "description": "Whose memories these are", "default": DEFAULTS["user"]},
            {"key": "budget", "description": "Tokens of summary a turn may carry", "default": DEFAULTS["budget"]},
        ]

    def save_config(self, values: Dict[str, Any], hermes_home: str) -> None:
        path = Path(hermes_home) / CONFIG_FILE
        current: Dict[str, Any] = {}
        if path.is_file():
            with contextlib.suppress(ValueError, OSError):
                current = json.loads(path.read_text())
        current.update({k: v for k, v in values.items() if k in DEFAULTS and k != "token"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")


def install(home: Optional[str] = None) -> Path:
    """Write the plugin folder Hermes discovers (``$HERMES_HOME/plugins/abridge/``)."""
    from . import __version__

    folder = hermes_home(home) / "plugins" / NAME
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text(PLUGIN_INIT)
    (folder / "plugin.yaml").write_text(PLUGIN_YAML.format(version=__version__))
    return folder


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m abridge_memory.hermes",
        description="Install abridge as a Hermes Agent memory provider.",
    )
    p.add_argument("command", choices=["install"])
    p.add_argument("--hermes-home", help="Hermes' home (default: $HERMES_HOME, then ~/.hermes)")
    a = p.parse_args(argv)
    folder = install(a.hermes_home)
    print(f"installed the abridge memory provider in {folder}")
    print("select it: `hermes memory setup abridge`, or in config.yaml: memory: {provider: abridge}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
