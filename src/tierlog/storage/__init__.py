"""tierlog.storage"""
