"""delivery/mqtt"""
