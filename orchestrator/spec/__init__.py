"""Spec: what a sweep is asked to do, read and validated (the sweep spec's schema; the spec's cost settings and what
a layout costs to train; the document lengths a packed workload is read from)."""
