-- A session's display names, kept apart from its id: the conversation's title (a Claude Code
-- summary line, a ChatGPT title) and its project folder, as JSON {"title", "project"}; sealed
-- at rest like the focus text (a sealed BLOB in the TEXT-declared column, `sealed` its data
-- key's version, 0 for plaintext).
CREATE TABLE session_labels (
    session TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0
);
