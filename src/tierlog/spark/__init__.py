"""tierlog.spark"""
