async def responses(engine, names, request): raise NotImplementedError
