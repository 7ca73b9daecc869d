"""The GangJob API (gangjob.io/v1alpha1).

`api.constants`: protocol names (standard library only). `api.v1alpha1`: pydantic models of
spec and status. `api.crd`: the CRD generated from them. Nothing is imported here, so that
`api.constants` stays importable without pydantic.
"""
