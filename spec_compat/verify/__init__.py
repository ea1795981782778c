"""spec_compat/verify"""
