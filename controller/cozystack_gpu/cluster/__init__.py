"""The cluster cache: informers (list then watch) and the view they feed, indexed for the
model. One view serves the binder and the admission feed."""
