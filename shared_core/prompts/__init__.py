"""Prompts of every algorithm, written in our own words, keeping each paper prompt's instructions and
placeholders. One module per algorithm; templates use ``str.format`` placeholders."""


def fence(text: str) -> str:
    """Data for a ``<<<`` ... ``>>>`` block: delimiter runs inside it are replaced (``‹‹‹`` / ``›››``) so
    text from memories can never close the block and pose as instructions."""
    return str(text).replace("<<<", "‹‹‹").replace(">>>", "›››")
