"""Images the conductor and the agent build or write: config drives and their placement.

- :mod:`.configdrive`: the Ironic ``configdrive`` value (dict, gzip+base64 ISO
  or URL) turned into ISO9660 bytes and back.
- :mod:`.configdrive_partition`: finding or making the ``config-2`` partition
  on a written whole-disk image and filling it.
- :mod:`.iso9660`, :mod:`.partition_table`, :mod:`.network_data`: the small
  pure-Python pieces those two are made of.
"""
