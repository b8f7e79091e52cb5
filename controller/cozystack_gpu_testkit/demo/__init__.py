"""``make demo``: the whole story of cozystack.gpu on a local control plane, checked act by act.

    make demo         # or: python -m cozystack_gpu_testkit.demo up
    make demo-down    # or: python -m cozystack_gpu_testkit.demo down

A platform (control plane, the chart, the controller replica), then eight acts: hosts laid out
by the host playbook and reported by their agents, the catalog, tenants' orders (and
refusals), a VM's start, a window booked minutes ahead (an order refused for it, a VM run in
it and stopped at its end), life (cordon, node failure, rebind, usage records), day two
(helm upgrade, a tenant's question, the hoster's view) and the end. The
story is :mod:`.story`, each act a module of :mod:`.acts`; what it runs on, :mod:`.platform`
and :mod:`.hosts`; how it reports, :mod:`.console`. ``controller/tests/e2e/test_demo.py`` runs
it without its tables.
"""
