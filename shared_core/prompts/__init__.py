"""Prompts of every algorithm, written in our own words, keeping each paper prompt's instructions and
placeholders. One module per algorithm; templates use ``str.format`` placeholders."""
