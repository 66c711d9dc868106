"""Prompt learning with DSPy (the hosted-API mode): optimisers score prompt programs in the
dream and confirm them on real tasks; the programs they save live in ``prompts/programs``."""
