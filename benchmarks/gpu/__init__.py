"""The GPU check (``python3 -m benchmarks.gpu.check``, ``make gpu-check``; docs/gpu-check.md).

``setup`` gets a host without network ready and imports only the standard library, as must this
package: both are imported before anything is installed. ``check`` runs the stages; ``run`` holds
what they share, ``quality`` and ``speed`` (with ``shapes`` and ``baselines``) measure.
"""
