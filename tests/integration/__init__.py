"""Tests on real jobs: multi-rank gloo processes, py-spy, MCP clients over stdio, the Inspector."""
