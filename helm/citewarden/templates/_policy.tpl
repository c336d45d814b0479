{{/*
The policy shipped as default.yaml when .Values.policies is empty: a copy of the repository's
policies/default.yaml (tests/test_helm_chart.py keeps them equal). Kept in a named template,
not a chart file, so app charts that include the sidecar templates render it too.
*/}}
{{- define "citewarden.defaultPolicy" -}}
# default.yaml — the chart's default policy (policies/default.yaml in the repository).
#
# Fronts the three supported protocols on their usual paths and blocks any answer with a
# citation problem. Blocking is the safest default: the client gets a clear 422 with the
# reason and the claim index, never an unverified answer.
name: default
mode: enforce                      # enforce | shadow — shadow is for rollouts only

routes:
  # OpenAI-compatible chat completions (JSON and SSE).
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai-chat

  # Anthropic Messages API; native citations are checked against the request's documents.
  - name: messages
    match: {path: /v1/messages}
    protocol: anthropic-messages

  # Any in-house RAG service under /rag/: retrieval happens upstream, so the context comes
  # from the response itself at `/sources`.
  - name: rag
    match: {path_prefix: /rag/}
    protocol: rag-json
    rag:
      answer: /answer              # JSON pointer to the answer text
      context: /sources            # JSON pointer to the list of retrieved chunks
      context_id: id               # field names inside each chunk
      context_text: text

# Model listing carries no claims; forward it untouched. Every other path that no route
# matches is refused (default deny). Entries take the path_glob forms: `/v1/files/*` is one
# segment below /v1/files, `/v1/files/**` the whole tree.
passthrough:
  - /v1/models

citations:
  format: doc-chunk                # [DOC:CHUNK], [a:1][b:2], [a:1, b:2], [DOC:CHUNK@V]

context:
  from: [request, response, header]

# Everything that can be checked without a model: cheap, deterministic and local.
checks:
  - missing_citation
  - malformed_citation
  - hallucinated_citation
  - stale_source
  - quote_mismatch
  - number_mismatch

release:
  on_unverified: block             # a single failing claim blocks the answer
  on_infrastructure_failure: abstain
  block_status: 422

# Buffer so a block is always a clean 422, even for streaming requests.
streaming:
  mode: buffer
{{- end }}
