"""spec_compat/core"""
