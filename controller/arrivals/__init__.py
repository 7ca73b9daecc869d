"""Direct arrival: agents report to the controller instead of writing their pod (docs/design.md
section 3). `book` holds the reports and joins them to the pods' views (domain); `auth` checks
who reports (TokenReview); `server` is the HTTP endpoint and its streams.
"""
