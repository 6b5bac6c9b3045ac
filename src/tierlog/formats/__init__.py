"""tierlog.formats"""
