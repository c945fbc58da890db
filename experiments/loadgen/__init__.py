"""``twinserve bench serve``: a load generator that speaks to OpenAI-compatible servers as
``vllm bench serve`` does, fed by the workload definitions the simulator uses.

==============  =======================================================================
``connection``  a lean asyncio HTTP/1.1 client: keep-alive pool, SSE streams, timestamps
``inputs``      a workload's stream as requests (token-id or text prompts, request ids)
``client``      sending them at their send times and measuring each as vllm bench does
``result``      vllm bench serve's metrics, result JSON and printed table
``run_log``     the client's times as an event log, alone or joined with server records
``run_dir``     the twinserve run directory of a benchmark (and its client record)
``bench``       the whole benchmark as one call (``run_bench``)
==============  =======================================================================
"""
