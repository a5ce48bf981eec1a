"""The agent's tools as the Model Context Protocol serves them: defined once
(:mod:`stash.tools.definitions`), served by ``stash mcp`` over stdio and by
``POST /mcp`` over Streamable HTTP (:mod:`stash.tools.server`)."""
