"""Speed measurements (`kairox bench`): dense against sparse decode on real models
(:mod:`.decode`), and random-weight models of real shapes for speed alone (:mod:`.synthetic`).
"""
