"""An MCP server whose tools misbehave on purpose, for tests/envs/test_mcp.py.

Built with the `mcp` SDK's own server class (MCPServer, FastMCP's name in mcp 2.x), so
what the client sees is what a real server sends. Run it as

    python tests/envs/mcp_server.py stdio
    python tests/envs/mcp_server.py http PORT       (streamable HTTP at /mcp)
    python tests/envs/mcp_server.py malformed       (hand-written stdio JSON-RPC: `broken`
                                                     answers what is not a result,
                                                     `unstructured` no structuredContent
                                                     for its output schema)

Tools: `echo` and `count` (a counter kept in the server process, to tell a shared server
from one per episode), `slow` (sleeps), `hang` (never answers), `wedge` (blocks the whole
server), `crash` (the process exits mid-call), `fail` (an `isError` result), `huge` (a
result of `chars` characters), `image` (an image, audio, a resource link and an embedded
resource), `structured` (structuredContent beside its text), `pid` and `getenv` (the process's id and
environment).
"""
from __future__ import annotations

import base64
import json
import os
import sys
import time


def build_server():
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import (AudioContent, BlobResourceContents, EmbeddedResource,
                           ImageContent, ResourceLink, TextContent)

    server = MCPServer("agentjax-test-tools")
    calls = {"count": 0}

    @server.tool()
    def echo(text: str) -> str:
        """Returns its text."""
        return text

    @server.tool()
    def count() -> str:
        """How many times count was called on this server process."""
        calls["count"] += 1
        return str(calls["count"])

    @server.tool()
    def getenv(name: str) -> str:
        """An environment variable of the server process ('' when unset)."""
        return os.environ.get(name, "")

    @server.tool()
    def pid() -> str:
        """The server's process id."""
        return str(os.getpid())

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answers after `seconds`."""
        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def hang() -> str:
        """Never answers (in a worker thread: the server answers other requests)."""
        while True:
            time.sleep(3600)

    @server.tool()
    async def wedge() -> str:
        """Blocks the server's event loop: no answer to anything any more."""
        time.sleep(3600)
        return "never"

    @server.tool()
    def crash() -> str:
        """The server process dies mid-call."""
        os._exit(3)

    @server.tool()
    def fail(reason: str) -> str:
        """A tool error (isError)."""
        raise ToolError(f"cannot do it: {reason}")

    @server.tool(structured_output=False)  # the text once, not twice
    def huge(chars: int) -> str:
        """A result of `chars` characters (a head, x's, a tail)."""
        return "HEAD" + "x" * max(chars - 8, 0) + "TAIL"

    @server.tool()
    def image() -> list:
        """One of each non-text content type, and a line of text."""
        png = b"\x89PNG\r\n\x1a\n" + b"\0" * 92
        return [
            TextContent(text="a picture:"),
            ImageContent(data=base64.b64encode(png).decode(), mime_type="image/png"),
            AudioContent(data=base64.b64encode(b"\0" * 300).decode(), mime_type="audio/wav"),
            ResourceLink(uri="file:///data/report.csv", name="report", mime_type="text/csv"),
            EmbeddedResource(resource=BlobResourceContents(
                uri="file:///data/blob.bin", mime_type="application/octet-stream",
                blob=base64.b64encode(b"\1" * 1000).decode())),
        ]

    @server.tool()
    def structured(x: int) -> dict:
        """A structured result: {"double": 2x}."""
        return {"double": 2 * x}

    return server


def serve_malformed() -> None:
    """A hand-written stdio server: `broken` answers with a result whose `content` is
    not a list, `unstructured` with text but not the structuredContent its output
    schema promises (no SDK server would send either)."""
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue  # a notification
        method, reply = message["method"], {"jsonrpc": "2.0", "id": message["id"]}
        if method == "initialize":
            reply["result"] = {"protocolVersion": message["params"]["protocolVersion"],
                               "capabilities": {"tools": {}},
                               "serverInfo": {"name": "malformed", "version": "0"}}
        elif method == "tools/list":
            reply["result"] = {"tools": [
                {"name": "broken", "description": "Malformed.",
                 "inputSchema": {"type": "object"}},
                {"name": "unstructured", "description": "No structuredContent.",
                 "inputSchema": {"type": "object"}, "outputSchema": {
                     "type": "object", "properties": {"a": {"type": "integer"}}}}]}
        elif method == "tools/call" and message["params"]["name"] == "unstructured":
            reply["result"] = {"content": [{"type": "text", "text": "a is 1"}]}
        elif method == "tools/call":
            reply["result"] = {"content": "not a list of content blocks", "isError": 7}
        else:
            reply["error"] = {"code": -32601, "message": f"no method {method}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "malformed":
        serve_malformed()
    elif mode == "http":
        build_server().run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        build_server().run("stdio")
