"""tierlog.server"""
