"""The cost model: peak memory and step time of one layout, one module per mechanism (memory, offload, pipeline
placement, routing skew, the dispatcher's all-to-all, FP8 casts, launch overhead, packed documents, ...).
`costmodel.estimate` is its front door."""
