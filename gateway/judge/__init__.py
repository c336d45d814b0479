"""The judge pass's remote side: prompts (render a call, parse its verdicts), the HTTP client
with its retries, circuit breaker and concurrency limit, and the verdict cache.

The pass itself (which claims go to the judge, how calls are grouped, how verdicts combine)
is `gateway.checks.judge`.
"""
