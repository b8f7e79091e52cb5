"""Test and development kit: a real local control plane, sysfs fixture trees, a fake kubelet.

Not used by the controller at run time; shipped in the same package so the test suite,
the benchmarks and `make cluster` share one implementation.
"""
