"""tierlog.read"""
