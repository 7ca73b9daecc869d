"""The GangJob API (gangjob.io/v1alpha1): pydantic models of spec and status, and the CRD built from them."""
