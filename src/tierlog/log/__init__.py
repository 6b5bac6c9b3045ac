"""tierlog.log"""
