"""tierlog.tiering"""
