"""1.3.1's ``llm_instrumentation.ebpf`` import path. Its BCC collectors are replaced by
strapd's probes (``strapd trace``, ``llm-prof``); only the correlation helpers remain here."""
