"""Metrics of an instance: `podium:*` server metrics, vLLM's `vllm:*`, one `/metrics`.

Modules, in boot order:
  multiproc     prepare_multiproc_dir(): first thing in `podium serve`, before anything
                imports prometheus_client (this package's other modules, vLLM)
  server        podium:* metrics and recording helpers
  exposition    render() / create_router(): the merged /metrics
  request_log   X-Request-Id middleware and one log line per request (HTTP)
  grpc_log      the same for one gRPC call: `async with track_grpc(context, method)`

This package's __init__ imports nothing, so importing `podium.metrics.multiproc` stays safe.
"""
