"""Serving the memories to other programs: the MCP server (:mod:`.mcp_server`) and its bearer-token
authorisation (:mod:`.mcp_auth`). An application above the library (``hiermem mcp``).
"""
