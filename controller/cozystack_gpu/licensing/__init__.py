"""The vGPU guest licence: which token copies exist where (``rules``, pure) and the leader's
part that keeps them so (``copier``)."""
