"""Devices and machines: the catalog (data with sources), and the local machine (detect, calibrate)."""
