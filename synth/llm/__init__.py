"""The LLM composer: any OpenAI-compatible server writes each task from sampled seed ops.

``prompts`` renders the packaged templates, ``client`` sends a request with retries and
backoff, ``cache`` keeps every reply on disk keyed by (prompt, model, params), ``parse``
validates a reply without executing it, and ``compose`` ties them together with the shared
sampler. Replies are only ever parsed here; the sandboxed filters are what execute them.
"""
