"""An OpenAI-SDK calculator agent, trained unmodified through slime's agent adapter."""
